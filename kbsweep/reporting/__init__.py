"""The report stage: boards from the tracking store, their renderings, plots and the dataset export. (Not `report`: that name is the API function kbsweep.report.) Imports: tracking and below."""
